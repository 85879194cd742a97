# In-tree defaults live in pytest.ini options of pyproject/tox; the plugin itself is loaded
# through its pytest11 entry point once the package is installed.
