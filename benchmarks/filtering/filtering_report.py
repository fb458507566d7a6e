"""placeholder"""


def report(raw, out, smoke=False):
    pass
