"""A Django app without a project, for tests/drivers/python/django_orm.py."""
