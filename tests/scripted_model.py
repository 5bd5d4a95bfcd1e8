"""The scripted 'model' of the runner tests, now `memlab.testing.models.scripted_model` (kept under its old name)."""

from memlab.testing.models import scripted_model as responder

__all__ = ["responder"]
