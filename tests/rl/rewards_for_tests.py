"""Reward functions importable by --custom-rm-path in the tests."""


def length_reward(response: str, label: str) -> float:
    return float(len(response) % 2)


def broken_reward(response: str, label: str) -> float:
    raise ValueError("reward server down")
