"""Configuration: the typed schema registered with Hydra, and the checks a type cannot make."""
