"""Tensor parallelism of the native Llama target over torch.distributed (docs/parallel.md).

shard.py cuts a LlamaNet into one rank's share; group.py holds the process group and the commands
rank 0 broadcasts; target.py is the CausalLM the engine drives on rank 0 and the loop the other
ranks run; launch.py starts and stops the ranks.
"""
