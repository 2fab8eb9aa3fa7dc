"""Config files: each ``get_config()`` returns an ml_collections.ConfigDict (variants import a base
and override a few keys)."""
