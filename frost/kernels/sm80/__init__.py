"""SM80 (Ampere mma.sync / cp.async / ldmatrix) attention kernels; they also run on Hopper."""
