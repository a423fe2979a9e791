"""Public test mixins (inherit them to test a new attention unit or GP head)."""

from .attention_unit import AttentionUnitTestCase
from .gp_head import GPHeadTestCase, count_factorisations

__all__ = ["AttentionUnitTestCase", "GPHeadTestCase", "count_factorisations"]
