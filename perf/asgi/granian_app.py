"""The gateway app for granian, which imports a factory instead of taking an object."""

from shoal.api import create_app
from shoal.config import load_settings


def factory():  # granian calls it with no arguments
    return create_app(load_settings())
