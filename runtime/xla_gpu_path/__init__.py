"""The XLA:GPU path: hlopt's driver of XLA's real GPU compiler (deviceless), re-emission (`hlopt compile`), and loading what it wrote on a GPU host."""
