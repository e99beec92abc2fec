"""kernelagent: turn a PyTorch reference module into a verified, faster GPU kernel."""

__version__ = "0.1.0"
