"""`etude demo`: the whole system end to end on the embedded default (see etude.demo.run)."""
