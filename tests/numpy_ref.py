"""Numpy references of lucid's formulas for the tests: written from the paper's definitions,
one loop or one line each, independent of lucid's code."""

import numpy as np

BINS = np.linspace(-20.0, 20.0, 255)  # model.num_bins, bins_low, bins_high (the defaults)


def np_symlog(x):
    return np.sign(x) * np.log1p(np.abs(x))


def np_symexp(x):
    return np.sign(x) * np.expm1(np.abs(x))


def np_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def np_log_softmax(x):
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def np_twohot(y, bins=BINS):
    """Two-hot weights of scalar targets `y` (symlog space) over sorted `bins`, one python
    loop per value: the two neighbouring bins get linear-interpolation weights; a value
    beyond the range puts all its weight on the edge bin."""
    y = np.asarray(y, dtype=np.float64)
    out = np.zeros(y.shape + (len(bins),))
    for idx in np.ndindex(y.shape):
        v = y[idx]
        if v <= bins[0]:
            out[idx + (0,)] = 1.0
            continue
        if v >= bins[-1]:
            out[idx + (len(bins) - 1,)] = 1.0
            continue
        k = int(np.searchsorted(bins, v, side="right")) - 1  # bins[k] <= v < bins[k+1]
        frac = (v - bins[k]) / (bins[k + 1] - bins[k])
        out[idx + (k,)] += 1.0 - frac
        out[idx + (k + 1,)] += frac
    return out


def np_twohot_ce(logits, target_real):
    """Cross-entropy of two-hot logits (over BINS) towards symlog(target)."""
    return -(np_twohot(np_symlog(target_real)) * np_log_softmax(logits)).sum(-1)


def np_twohot_mean(logits):
    """symexp of the expected bin under softmax(logits)."""
    return np_symexp((np.exp(np_log_softmax(logits)) * BINS).sum(-1))


def loop_lambda_return(r, c, v, gamma, lam):
    """The recursion of the definition, one scalar at a time."""
    H1, N = r.shape
    H = H1 - 1
    out = np.zeros((H, N))
    for n in range(N):
        R = v[H, n]
        for t in reversed(range(H)):
            R = r[t + 1, n] + gamma * c[t + 1, n] * ((1 - lam) * v[t + 1, n] + lam * R)
            out[t, n] = R
    return out


def loop_imagined_weights(c, gamma):
    """Loss weights of imagined steps, one scalar at a time: w_t = prod_{i<=t} (gamma c_i) /
    gamma (so w_0 = c_0)."""
    out = np.zeros(c.shape)
    for n in range(c.shape[1]):
        prod = 1.0
        for t in range(c.shape[0]):
            prod *= gamma * c[t, n]
            out[t, n] = prod / gamma
    return out


def t2n(x):
    """A torch tensor as a float64 numpy array."""
    return x.detach().double().cpu().numpy()
