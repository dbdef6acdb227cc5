"""gptport's benchmarks: each script a module run from the repository's root as
`python -m benchmarks.<group>.<name>` (`--help` says what it measures), grouped by what it measures. Every
run is a series of probed rounds (harness.probe: a disturbed round is discarded) and writes one results
file in one layout (harness.results) under benchmarks/results/; `python -m benchmarks.render` makes
docs/performance/ and the README's headline table from those files."""
