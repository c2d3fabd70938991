from django.db import migrations


def add_counter(apps, schema_editor):
    apps.get_model("django_drv", "Counter").objects.create(id=1, value=0)


class Migration(migrations.Migration):
    dependencies = [("django_drv", "0001_initial")]

    operations = [migrations.RunPython(add_counter, migrations.RunPython.noop)]
