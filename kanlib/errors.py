"""The errors a config check raises, below both kanlib.config and kanlib.data (the data's checks of a
config's task raise them too), so neither has to import the other for them."""


class ConfigError(ValueError):
    """A config field holds a value that cannot run; the message names the field."""
