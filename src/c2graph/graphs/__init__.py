"""The graphs: capture and replay (CUDA graphs, or their CPU emulation), the prefill graph runner,
and the broken ways of handling extend offsets that a captured graph exposes."""
