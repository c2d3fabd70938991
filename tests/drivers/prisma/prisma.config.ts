// Only `prisma generate` reads this (at install time): no datasource URL is needed for it.
import { defineConfig } from "prisma/config";

export default defineConfig({
  schema: "schema.prisma",
});
