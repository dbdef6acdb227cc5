"""`python -m gptport …` (what torchrun runs: `torchrun … -m gptport train …`)."""

from gptport.cli.main import main

main()
