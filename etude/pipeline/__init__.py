"""The learning pipeline, once: resumable stages (`stages`), the function-level split of an
organisation's tasks (`split`), paired comparisons (`compare`), and `etude specialise`
(`specialise`, with its report). `etude demo` and the learning benches run their stages here."""
