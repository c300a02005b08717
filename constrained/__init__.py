"""Constrained decoding: output that follows a regular expression or a JSON schema.

A rung of its own beside the models: it takes any level's logits and the tokenizer's
vocabulary, and knows nothing of how the logits were computed. The chapter is the
"Output that follows a schema" section of docs/serving.md.

* ``regex.py``: the pattern subset, parsed into a tree of character sets (and
  ``Graph``, an automaton inside a tree);
* ``schema.py``: the JSON-schema subset, compiled to such a tree, with ``numbers.py``
  (integer ranges, multiples), ``formats.py`` (``date``, ``email``, ...),
  ``exclusive.py`` (when ``oneOf``'s branches exclude each other) and ``values.py``
  (JSON Schema's types and equality);
* ``automaton.py``: the tree to a Thompson NFA over UTF-8 bytes, then to a DFA whose
  every state can still reach an accepting one;
* ``algebra.py``: languages of characters as automata, met and subtracted (a pattern
  and a length, a name that matches one pattern and no property);
* ``language.py``: ``Language``, a pattern with its DFA, compiled once;
* ``vocabulary.py``: each token's bytes, and the vocabulary as a byte trie;
* ``masks.py``: the fast path: ``Index`` (a language over a vocabulary: the mask of a
  DFA state from one walk of the trie, cached per state) and ``Constraint`` (one
  request's state: ``apply(logits)`` before the sampler, ``advance(token)`` after;
  with a budget of tokens, room kept to end the text within it);
* ``definition.py``: the definition, plain and slow (every token checked against the
  NFA, simulated), which the tests hold the fast path to, token for token.

Usage::

    language = Language.schema({"type": "object", "properties": {...}})
    index = Index(language, Tokens.from_tokenizer(tokenizer), stop_ids=(eos,))
    tokens = model.stream(prompt, 64, constraint=index.constraint(64), stop_ids=(eos,))

A mask is the rule "this token keeps the text a prefix of the language", applied at
each step to the model's distribution: it is not sampling from the model conditioned
on the whole text being in the language (docs/serving.md works an example).
"""

from .automaton import EmptyLanguage, LanguageTooLarge
from .language import Language
from .masks import Constraint, Index, NoTokenAllowed, Tokens
from .regex import RegexError
from .schema import SchemaError, UnsupportedSchema

__all__ = [
    "Constraint",
    "EmptyLanguage",
    "Index",
    "Language",
    "LanguageTooLarge",
    "NoTokenAllowed",
    "RegexError",
    "SchemaError",
    "Tokens",
    "UnsupportedSchema",
]
