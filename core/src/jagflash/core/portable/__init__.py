"""The portable (stock Triton) kernels' parts: ``mainloop`` (the forward, dQ and dK/dV tile
programs and the sequence records) and ``persistent`` (the walker and the persistent launches).
They run on any CUDA GPU and, under ``TRITON_INTERPRET=1``, on the CPU."""
