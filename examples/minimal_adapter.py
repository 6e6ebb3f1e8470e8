"""The smallest complete adapter: a numpy EGGROLL with only the four required methods (the example of docs/ports.md).

    python -m parity check --port examples.minimal_adapter:adapter
"""
import numpy as np


class MinimalAdapter:
    name = "minimal numpy EGGROLL"
    jax_compatible_rng = False      # numpy's generator: the suite compares the noise in distribution

    def noise(self, shapes, seed, epoch, members, pop, sigma, rank):
        sign = np.where(members % 2 == 0, 1, -1).astype(np.float32)   # interleaved pairs (2k: +, 2k+1: -)
        out = {}
        for leaf, (name, shape) in enumerate(sorted(shapes.items())):  # noise_reuse=0: epoch is not used
            rng = np.random.default_rng([seed, leaf])
            if name.endswith(".weight"):
                n_out, n_in = shape
                z = rng.standard_normal((pop // 2, n_in + n_out, rank), dtype=np.float32)[members // 2]
                out[name] = (z[:, n_in:] * (sign * np.float32(sigma / np.sqrt(rank)))[:, None, None], z[:, :n_in])
            else:
                eps = rng.standard_normal((pop // 2, *shape), dtype=np.float32)[members // 2]
                out[name] = eps * (sign * np.float32(sigma))[:, None]
        return out

    def perturbed_linear(self, W, A, B, x):
        return x @ W.T + (x @ B) @ A.transpose(0, 2, 1)

    def shape_fitness(self, f, group_size=0):
        if not np.all(np.isfinite(f)):
            raise ValueError("fitness must be finite")
        g = f.reshape(-1, group_size or len(f))
        return (g - g.mean(1, keepdims=True)).ravel() / np.sqrt(f.var() + np.float32(1e-5))

    def gradient(self, noise, shaped, sigma):
        grads = {}
        for name, v in noise.items():
            if isinstance(v, tuple):      # weight: (A, B); its bias gets zeros unless it has noise too
                grads[name] = np.einsum("nir,njr->ij", shaped[:, None, None] * v[0], v[1]) / np.float32(len(shaped))
                grads.setdefault(name.replace(".weight", ".bias"), np.zeros(v[0].shape[1], np.float32))
            else:
                grads[name] = (shaped[:, None] * v).mean(0)
        return grads


adapter = MinimalAdapter()
