"""The `isolated` Hydra launcher (hydra/launcher=isolated): every multirun job in a fresh Python process."""
