"""Scale-out training pieces: low precision (MXFP8 / FP8), MoE routing replay, parallel layouts.

Nothing here is imported by the single-CPU path unless a config asks for it."""
