"""One decoding engine: every token the ladder writes comes out of it.

Read it in this order, each module one role: ``request.py`` (a ``Request``: a prompt, its
sampling, what ends it, its constraint and draft; its state on the way, a ``Sequence``),
``scheduler.py`` (which sequences run this turn, what each pass feeds), ``blocks.py`` (a
paged cache's blocks handed out, shared by prefix, given back), ``runner.py`` (a pass's
``ids`` and ``positions`` made, the model's plain pass called: the one place a decoding loop
calls a model), ``step.py`` (a pass's logits to the tokens a sequence takes: mask, choose,
plain decoding being speculative decoding's rule with no guess, advance, stop),
``drafts.py`` (a model as a draft; the n-gram draft is ``levels.common.speculative``'s),
``engine.py`` (``Engine``, the turn that ties them together). ``protocols.py`` says what
the engine asks of a model, a cache, a constraint, a draft and a text. The engine imports
no level: a model is whatever offers its plain pass.
"""

from levels.common.speculative import Counts, NGramDraft, commands_ngram

from .blocks import BLOCK_SIZE, BlockPool, OutOfBlocks, Table
from .drafts import ModelDraft
from .engine import PREFILL_TOKENS, Engine
from .request import Request, Sequence
