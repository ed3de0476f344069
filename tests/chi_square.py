"""The chi-square tail, for tests that check a sampler's draws against its probabilities."""
import math


def chi2_sf(x: float, df: int) -> float:
    """P(X > x) for a chi-square variable with integer df, in closed form."""
    h = x / 2
    if df % 2 == 0:  # a Poisson tail
        return math.exp(-h) * sum(h**i / math.factorial(i) for i in range(df // 2))
    # odd df: the df = 1 tail plus terms that climb by two degrees of freedom each
    sf = math.erfc(math.sqrt(h))
    term = math.exp(-h) * math.sqrt(h) / math.gamma(1.5)
    for k in range(1, (df - 1) // 2 + 1):
        sf += term
        term *= h / (k + 0.5)
    return sf
