"""An evaluation set that holds samples the weights were trained on is refused (evaluate on the run's own
training samples) or warned about and recorded (the samples of the run init_from fine-tuned from)."""

import json

import numpy as np
import pytest
from conftest import TINY, metrics, module_in_process, outputs_of, run_in_process

DIGITS = 1797  # scikit-learn's digits


def _split(seed, fraction):
    """The documented split of digits/synthetic: a permutation of the seed, validation first."""
    order = np.random.RandomState(seed).permutation(DIGITS)
    n_val = int(round(DIGITS * fraction))
    return set(order[n_val:]), set(order[:n_val])


@pytest.mark.slow
def test_evaluate_refuses_a_split_that_holds_the_runs_training_samples(tiny_run):
    proc = module_in_process("runner.evaluate", f"run={tiny_run}", "data.val_fraction=0.9", check=False)
    train, _ = _split(0, 0.2)
    seen = len(train & _split(0, 0.9)[1])
    err = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"would hold {seen} of the run's own training samples (of 1617" in err and "data.val_fraction" in err
    # A smaller fraction is a subset of the run's validation set: evaluated, and the check recorded.
    proc = module_in_process("runner.evaluate", f"run={tiny_run}", "data.val_fraction=0.1")
    m = json.loads((outputs_of(proc) / "metrics.json").read_text())
    assert m["samples"] == 180 and m["training_overlap"]["seen_in_training"] == 0


@pytest.mark.slow
def test_init_from_a_run_of_another_seed_warns_and_records_the_overlap(tmp_path, tiny_run, caplog):
    run_in_process(tmp_path / "tuned", *TINY, f"init_from={tiny_run}", "seed=1")
    overlap = metrics(tmp_path / "tuned")["fine_tune"]["validation_overlap"]
    expected = len(_split(0, 0.2)[0] & _split(1, 0.2)[1])
    assert expected > 200 and overlap["seen_in_training"] == expected and overlap["val_samples"] == 359
    assert overlap["source"] == str(tiny_run)
    log = (tmp_path / "tuned" / "runner.log").read_text()
    assert f"{expected} of this run's 359 validation samples are training samples of {tiny_run}" in log
    # Evaluating the fine-tuned run says it again, and records it beside its own (clean) split.
    proc = module_in_process("runner.evaluate", f"run={tmp_path / 'tuned'}")
    m = json.loads((outputs_of(proc) / "metrics.json").read_text())
    assert m["training_overlap"]["seen_in_training"] == 0
    assert m["training_overlap"]["init_from"]["seen_in_training"] == expected
