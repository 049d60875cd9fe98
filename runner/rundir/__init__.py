"""The run directory: who holds it, what may resume into it, atomic writes, and a finished run read back."""
