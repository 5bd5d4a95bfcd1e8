"""memlab: a Jupyter-first research toolkit for long-term conversational memory (LoCoMo-10).

Stages, one direction: data -> memory -> index -> extract -> answer -> eval -> trace/attribution -> plots.
"""

__version__ = "0.1.0"
