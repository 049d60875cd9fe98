"""`runner-configs cp` never writes over anything: not a file, not through a symbolic link, not under a file."""

import os

import pytest

from runner.cli.commands import configs_main as main


@pytest.mark.parametrize("case", ["symlink", "dangling symlink", "existing file", "under a file", "dest is a file"])
def test_cp_refuses_what_it_would_overwrite_in_one_paragraph(tmp_path, capsys, case):
    victim = tmp_path / "victim.yaml"
    victim.write_text("precious: 1\n")
    dest = tmp_path / "conf" / "optim" / "fast_sgd.yaml"
    dest.parent.mkdir(parents=True)
    if case == "symlink":
        os.symlink(victim, dest)
    elif case == "dangling symlink":
        os.symlink(tmp_path / "nowhere.yaml", dest)
    elif case == "existing file":
        dest.write_text("precious: 1\n")
    elif case == "under a file":
        dest = victim / "fast_sgd.yaml"
    else:  # a directory destination that is a file: <dest>/optim/my_sgd.yaml cannot be made
        dest = victim
    assert main(["cp", "optim/sgd", str(dest)]) == 2
    err = capsys.readouterr().err
    assert "\n\n" not in err.strip() and "Traceback" not in err  # one paragraph
    err = " ".join(err.split())
    assert err.startswith("Error: runner-configs cp:") and "nothing was copied" in err
    assert victim.read_text() == "precious: 1\n" and not (tmp_path / "nowhere.yaml").exists()


def test_cp_writes_a_new_file(tmp_path, capsys):
    dest = tmp_path / "conf" / "optim" / "fast_sgd.yaml"
    assert main(["cp", "optim/sgd", str(dest)]) == 0
    assert "name: sgd" in dest.read_text() and "Copied optim/sgd" in capsys.readouterr().out
