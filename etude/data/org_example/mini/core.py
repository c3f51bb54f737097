def clamp(x, lo, hi):
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def total(xs):
    s = 0
    for x in xs:
        s = s + x
    return s


def count_pos(xs):
    n = 0
    for x in xs:
        if x > 0:
            n = n + 1
    return n


def scale(xs, k):
    return [x * k for x in xs]


def last(xs, default):
    if len(xs) > 0:
        return xs[-1]
    return default


def span(xs):
    return max(xs) - min(xs)
