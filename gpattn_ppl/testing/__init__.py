"""Public test mixins (inherit them to test a new attention unit)."""

from .attention_unit import AttentionUnitTestCase

__all__ = ["AttentionUnitTestCase"]
