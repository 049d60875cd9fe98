"""`python -m runner [overrides]`: Hydra composes conf/ into the typed config and hands it to run()."""

import sys
import textwrap

import hydra

from runner.errors import UserError
from runner.preflight import check_output_dir
from runner.schema import register
from runner.validate import validate

register()


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg) -> float:
    try:
        if cfg.dry_run:
            validate(cfg)
            print("Configuration is valid (dry_run=true: nothing was trained).")
            return None
        from runner.run import run  # MindSpore loads only after the config composed cleanly

        return run(cfg)["val_accuracy"]
    except UserError as e:
        # A user's mistake gets one readable paragraph and exit status 2, not a traceback.
        # Paths must stay copyable: never break inside them.
        text = textwrap.fill(f"Error: {e}", width=100, break_on_hyphens=False, break_long_words=False)
        print(text, file=sys.stderr, flush=True)
        sys.exit(2)


if __name__ == "__main__":
    check_output_dir(sys.argv[1:])
    main()
