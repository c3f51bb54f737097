"""A small library of an example organisation (`etude demo --quick`, the specialise tests)."""
