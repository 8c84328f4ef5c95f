"""Reward functions for --custom-rm-path in the safety tests: each returns something a
reward must not be."""


def nan_reward(response: str, label: str) -> float:
    return float("nan")


def inf_reward(response: str, label: str) -> float:
    return float("-inf")


def text_reward(response: str, label: str):
    return "good"
