"""The compressor: one ratio-2 source layer, its batch, its caches, and the two paths that fill them.

- :mod:`.config`, :mod:`.source_layer`: sizes, seeded weights, the source projection
- :mod:`.req_to_token`, :mod:`.batch`, :mod:`.extend_offsets`: an extend batch and its metadata;
  :mod:`.rows`: what each of its rows does; :mod:`.static_batch`: the batch a captured graph reads
- :mod:`.pools`, :mod:`.ring`: the caches a batch writes, and the pending-pair ring
- :mod:`.torch_path`: the compressor as plain torch ops (the reference)
- :mod:`.fused`: the compressor as one Triton launch
- :mod:`.model`: many source layers, one Pools each
- :mod:`.arguments`: the argument checks every entry point shares (an int, a device, the tensors)
"""
