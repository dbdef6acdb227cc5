"""The gptport command line (installed as the package `gptport.cli`)."""
