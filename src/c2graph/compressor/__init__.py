"""The compressor: one ratio-2 source layer, its batch, its caches, and the two paths that fill them.

- :mod:`.config`, :mod:`.source_layer`: sizes, seeded weights, the source projection
- :mod:`.req_to_token`, :mod:`.batch` (:mod:`.batch_values`: its requests, its rows made and sent in
  one copy, and checked against them), :mod:`.extend_offsets`: an extend batch and its metadata;
  :mod:`.rows`: what each of its rows does (the row plan)
- :mod:`.pools`, :mod:`.ring`: the caches a batch writes, and the pending-pair ring
- :mod:`.torch_path`: the compressor as plain torch ops (the reference)
- :mod:`.fused`: the compressor as one Triton launch (:mod:`.fused_blocks`: how the kernel cuts its
  work, and its grid); :mod:`.fused_kernel` the kernel, built from
  :mod:`.fused_rows` (which row each lane computes, where it stores) and :mod:`.fused_math` (the
  math stages); :mod:`.triton_compat`: the three operations Triton's CPU interpreter gets wrong;
  :mod:`.programs`: what each program of the kernel does for a batch, on the host (pictures, checks)
- :mod:`.compress`: one eager entry point, from hidden states to written caches, by the layer's path
- :mod:`.model`: many source layers, one Pools each
- :mod:`.arguments`: the checks of one argument every entry point shares (an int, a device, a
  tensor), and the record of calls whose arguments passed (checked once, not every call); :mod:`.checks`: the checks that a layer, a batch and pools belong together
"""
