"""`python -m runner [overrides]`: Hydra composes conf/ into the typed config and hands it to run()."""

import hydra

from runner.schema import register

register()


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg) -> float:
    from runner.run import run  # MindSpore loads only after the config composed cleanly

    return run(cfg)["val_accuracy"]


if __name__ == "__main__":
    main()
