"""Structured output: constraints (JSON schema, JSON object, regex, Lark grammar) applied exactly
under speculation (rule 8 of the design; docs/structured.md).

spec.ConstraintSpec: what a request asks for (plain data). grammar.GrammarCompiler: compiles specs
for a tokenizer, cached. sequence.SequenceConstraint: one sequence's matcher through the rounds.
masking: the pure tensor part (masks, masked logits, masked q).
"""

from specdec.constraints.spec import ConstraintSpec

__all__ = ["ConstraintSpec"]
