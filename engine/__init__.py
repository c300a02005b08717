"""One decoding engine: every token the ladder writes comes out of it.

Read it in this order, each module one role:

* ``request.py``: a ``Request`` (a prompt, its sampling, what ends it, its constraint and
  draft) and its state on the way, a ``Sequence``;
* ``scheduler.py``: which sequences run this turn, and what each pass feeds;
* ``blocks.py``: the block manager of a paged cache (blocks handed out, shared by prefix,
  given back);
* ``runner.py``: a pass's ``ids`` and ``positions`` made, the model's plain pass called
  (the one place a decoding loop calls a model), over a level's cache, a paged one, or none;
* ``step.py``: the logits after a pass to the tokens a sequence takes: mask, choose (plain
  decoding is speculative decoding's rule with no guess), advance, stop;
* ``drafts.py``: a draft that is a model (the n-gram draft, which needs none, is
  ``levels.common.speculative``'s);
* ``engine.py``: ``Engine``, the turn that ties them together.

``protocols.py`` says what the engine asks of a model, a cache, a constraint, a draft and a
text. The engine imports no level: a model is whatever offers its plain pass.
"""

from levels.common.speculative import Counts, NGramDraft, commands_ngram

from .blocks import BLOCK_SIZE, BlockPool, OutOfBlocks, Table
from .drafts import ModelDraft
from .engine import PREFILL_TOKENS, Engine
from .request import Request, Sequence
