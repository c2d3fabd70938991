class AddNoteToEntries < ActiveRecord::Migration[6.1]
  def change
    add_column :ar_entries, :note, :string, null: false, default: ""
  end
end
