"""The pictures: drawings of batches, the ring, the fused kernel's programs and captured graphs,
and the explorer widgets (``python -m c2graph figures FOLDER``, in :mod:`c2graph.workshop.figures`,
writes them to ``figures/``).

Modules: :mod:`.style` (what every picture shares: colours, words, sizes), :mod:`.draw` (a
ragged batch, the ring, the gate), :mod:`.diagram` (the block diagram of one source layer),
:mod:`.draw_fused` (notebook 02: the offsets, the programs, the GPU's words, costs),
:mod:`.draw_park` (notebook 02: one request's ring read and park, step by step),
:mod:`.draw_offsets` (the static offsets tensor and its rows), :mod:`.draw_graph` (the prefill
graph's buffers and nodes, and the slots a replay got wrong), :mod:`.timeline` (where one launch's
programs spend their time), :mod:`.bench_plots` (stored benchmark results), :mod:`.explorer` and
:mod:`.offsets_explorer` (the notebooks' sliders).
"""
