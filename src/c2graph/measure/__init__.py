"""The measurements: comparing results (:mod:`.compare`), counting ops and kernels
(:mod:`.opcount`), and the GPU benchmark (:mod:`.bench`)."""
