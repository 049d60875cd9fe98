"""Training: the recipe (environment -> build -> train -> report) and the consumers of its config groups."""
