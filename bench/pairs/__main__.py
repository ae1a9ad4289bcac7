"""``python -m bench.pairs``: the pairs benchmark's load generator (:mod:`.generator`)."""

import anyio

from bench.pairs.generator import generator_main

anyio.run(generator_main, backend="asyncio")
