"""flashattn's benchmarks: bench_attention.py (the speed sweep and the measurements
it is built from) and suite/ (the report of `python -m benchmarks.suite`)."""
