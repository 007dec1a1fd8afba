"""The engine layer: one round loop over a batch of sequences, and the controller that plans each
step's draft budgets.

- batched.py: BatchedEngine, continuous batching over a slot model (every batch size runs here);
- single.py: Engine, one sequence at a time (a batch of one over BatchedEngine);
- controller.py: the speculation boundary (plan / record) and the request, fixed and auto options;
- auto.py: `--speculation auto`, a bandit over draft caps per load.
"""

from specdec.engine.batched import BatchConfig, BatchedEngine, SequenceHandle, SequenceResult
from specdec.engine.controller import Auto, FixedK, RequestK, Speculation, StepTrace, speculation_from_flag
from specdec.engine.single import Engine
from specdec.generation import EmittedToken, Generation, GenerationConfig, Origin, SpecStats

__all__ = ["Auto", "BatchConfig", "BatchedEngine", "EmittedToken", "Engine", "FixedK", "Generation",
           "GenerationConfig", "Origin", "RequestK", "SequenceHandle", "SequenceResult", "SpecStats",
           "Speculation", "StepTrace", "speculation_from_flag"]
