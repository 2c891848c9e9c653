"""Tests over the whole project: the layers' import rules, the docs against the tree, the cold import set."""
