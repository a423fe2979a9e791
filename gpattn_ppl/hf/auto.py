"""The swapped model types, registered with ``transformers`` when :mod:`gpattn_ppl.hf` is
imported.

Importing :mod:`gpattn_ppl.hf` imports this module, which registers the ``gpattn_<host>``
model type of every host of :data:`~gpattn_ppl.models.swapped_types.DEFAULT_HOSTS` (BERT and
MiniLM, RoBERTa, XLM-RoBERTa, CamemBERT, ELECTRA, ALBERT, DeBERTa, DeBERTa-v2/v3, MPNet,
ModernBERT, DistilBERT, ViT; those the installed ``transformers`` has)
with ``AutoConfig``, the Auto model classes the host has (``AutoModel``,
``AutoModelForSequenceClassification``, ``AutoModelForTokenClassification``,
``AutoModelForMaskedLM``, ...; :data:`~gpattn_ppl.models.swapped_types.AUTO_MODELS`), and the
host's tokenizer and processors. After ``import gpattn_ppl.hf``, a folder saved from a swapped
model loads with them, and with ``transformers.pipeline``::

    import gpattn_ppl.hf                 # registers the swapped types
    import transformers

    model = transformers.AutoModelForSequenceClassification.from_pretrained(folder)
    classify = transformers.pipeline("text-classification", model=folder)

No code is read from the folder (no ``auto_map``, no ``trust_remote_code``): the classes are
generated here from ``transformers``' own (:mod:`gpattn_ppl.models.swapped_types`). The swap
itself registers the type of the host it swaps into, and
:func:`~gpattn_ppl.hf.hub.from_pretrained` the type of the folder it reads; a folder of
another host loads with the Auto classes after
:func:`register_swapped_types` ``(host_model_type)``.
"""

from __future__ import annotations

from ..models.swapped_types import register_swapped_types

__all__ = ["REGISTERED", "register_swapped_types"]

#: the swapped model types registered on import (``"gpattn_bert"``, ...)
REGISTERED: tuple[str, ...] = tuple(register_swapped_types())
