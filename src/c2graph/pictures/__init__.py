"""The pictures: drawings of batches, the ring, the fused kernel's programs and captured graphs,
the explorer widget, and ``python -m c2graph figures FOLDER`` that writes them to ``figures/``."""
