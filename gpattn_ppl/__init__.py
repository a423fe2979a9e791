"""gpattn_ppl: uncertainty-aware Transformer attention from GP and stochastic units."""

__version__ = "0.1.0"
