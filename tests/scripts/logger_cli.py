"""LightningCLI entry point for the logger tests: the logger chosen from the command line."""

from lightning.pytorch.cli import LightningCLI

from tests.scripts.logger_train import TinyModel

if __name__ == "__main__":
    LightningCLI(TinyModel)
