"""Example components: each file adds one component to memlab (the one-file rule of issue 9)."""
