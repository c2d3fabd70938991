import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="Account",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("name", models.CharField(max_length=50, unique=True)),
                ("balance", models.IntegerField(default=0)),
            ],
        ),
        migrations.CreateModel(
            name="Counter",
            fields=[
                ("id", models.IntegerField(primary_key=True, serialize=False)),
                ("value", models.IntegerField(default=0)),
            ],
        ),
        migrations.CreateModel(
            name="Entry",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("amount", models.IntegerField()),
                ("note", models.CharField(default="", max_length=50)),
                ("account", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE,
                                              related_name="entries", to="django_drv.account")),
            ],
        ),
    ]
