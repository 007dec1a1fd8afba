"""`specdec audit`: does a server's speculative decoding change its answers? Against any OpenAI API.

Two servers of the same model are asked the same prompts: the reference (no speculation) and the
candidate (speculation on). Greedy answers must be identical; sampled answers must follow the same
distribution, which two-sample tests on the first tokens check, with a correction across prompts and
a statement of how large a difference the run could have seen.

Files, read top to bottom in this order: prompts.py (the prompt set), client.py (HTTP, one side a
server), stats.py (the tests), greedy.py and sampled.py (the two comparisons), report.py (table,
JSON, plots, exit status), run.py (the whole audit, with a partial report when a server stops).
"""
