// ImGuiCanvas: Qt input and display state into ImGui, ImGui's draw lists out through OpenGL 3.3.
#include "app/gui/imgui_canvas.h"

#include <imgui.h>

#include <QClipboard>
#include <QFile>
#include <QGuiApplication>
#include <QKeyEvent>
#include <QMouseEvent>
#include <QOpenGLContext>
#include <QWheelEvent>
#include <algorithm>
#include <cstdio>

#include "app/gui/help_overlay.h"
#include "viz/qt/painter_renderer.h"

namespace kvlens::app {
namespace {

constexpr const char* kVertexShader = R"(#version 330 core
layout (location = 0) in vec2 position;
layout (location = 1) in vec2 uv;
layout (location = 2) in vec4 color;
uniform mat4 projection;
out vec2 fragment_uv;
out vec4 fragment_color;
void main() {
  fragment_uv = uv;
  fragment_color = color;
  gl_Position = projection * vec4(position, 0.0, 1.0);
}
)";

constexpr const char* kFragmentShader = R"(#version 330 core
in vec2 fragment_uv;
in vec4 fragment_color;
uniform sampler2D glyphs;
layout (location = 0) out vec4 out_color;
void main() { out_color = fragment_color * texture(glyphs, fragment_uv); }
)";

// Qt's keys as ImGui 1.86 knows them (io.KeyMap maps each ImGuiKey to itself).
int imgui_key(int qt_key) {
  switch (qt_key) {
    case Qt::Key_Tab:
      return ImGuiKey_Tab;
    case Qt::Key_Left:
      return ImGuiKey_LeftArrow;
    case Qt::Key_Right:
      return ImGuiKey_RightArrow;
    case Qt::Key_Up:
      return ImGuiKey_UpArrow;
    case Qt::Key_Down:
      return ImGuiKey_DownArrow;
    case Qt::Key_PageUp:
      return ImGuiKey_PageUp;
    case Qt::Key_PageDown:
      return ImGuiKey_PageDown;
    case Qt::Key_Home:
      return ImGuiKey_Home;
    case Qt::Key_End:
      return ImGuiKey_End;
    case Qt::Key_Insert:
      return ImGuiKey_Insert;
    case Qt::Key_Delete:
      return ImGuiKey_Delete;
    case Qt::Key_Backspace:
      return ImGuiKey_Backspace;
    case Qt::Key_Space:
      return ImGuiKey_Space;
    case Qt::Key_Return:
      return ImGuiKey_Enter;
    case Qt::Key_Escape:
      return ImGuiKey_Escape;
    case Qt::Key_Enter:
      return ImGuiKey_KeyPadEnter;
    case Qt::Key_A:
      return ImGuiKey_A;
    case Qt::Key_C:
      return ImGuiKey_C;
    case Qt::Key_V:
      return ImGuiKey_V;
    case Qt::Key_X:
      return ImGuiKey_X;
    case Qt::Key_Y:
      return ImGuiKey_Y;
    case Qt::Key_Z:
      return ImGuiKey_Z;
    default:
      return -1;
  }
}

int imgui_button(Qt::MouseButton button) {
  switch (button) {
    case Qt::LeftButton:
      return 0;
    case Qt::RightButton:
      return 1;
    case Qt::MiddleButton:
      return 2;
    default:
      return -1;
  }
}

// Each glyph's quad grows by one texel of the transparent padding around it in the atlas. A
// thin stroke drawn small (the minus sign of a figure's legend: 2 texels of a 26 px raster drawn
// at 11 px) otherwise makes a quad under a pixel tall that covers no pixel centre, and the
// rasterizer draws nothing.
void pad_glyph_quads(ImFontAtlas& atlas, const ImFontConfig& config) {
  const float du = 1.0f / float(atlas.TexWidth), dv = 1.0f / float(atlas.TexHeight);
  const float dx = 1.0f / float(config.OversampleH), dy = 1.0f / float(config.OversampleV);
  for (ImFont* font : atlas.Fonts) {
    for (ImFontGlyph& glyph : font->Glyphs) {
      if (!glyph.Visible) continue;
      glyph.X0 -= dx;
      glyph.X1 += dx;
      glyph.Y0 -= dy;
      glyph.Y1 += dy;
      glyph.U0 -= du;
      glyph.U1 += du;
      glyph.V0 -= dv;
      glyph.V1 += dv;
    }
  }
}

// The font file's bytes, kept for the atlas (which is told not to own them).
const QByteArray& font_bytes() {
  static const QByteArray bytes = [] {
    viz::figure_font_family();  // registers the resource
    QFile file(":/kvlens/fonts/DejaVuSans.ttf");
    return file.open(QIODevice::ReadOnly) ? file.readAll() : QByteArray();
  }();
  return bytes;
}

}  // namespace

ImGuiCanvas::ImGuiCanvas(QWidget* parent) : QOpenGLWidget(parent) {
  setFocusPolicy(Qt::StrongFocus);
  setMouseTracking(true);
  setAttribute(Qt::WA_InputMethodEnabled, true);
  context_ = ImGui::CreateContext();
  ImGui::SetCurrentContext(context_);
  ImGuiIO& io = ImGui::GetIO();
  io.IniFilename = nullptr;  // window layout is ours, not a file in the working directory
  io.BackendPlatformName = "kvlens-qt";
  io.BackendRendererName = "kvlens-opengl3";
  io.BackendFlags |= ImGuiBackendFlags_RendererHasVtxOffset | ImGuiBackendFlags_HasMouseCursors;
  for (int key = 0; key < ImGuiKey_COUNT; ++key) io.KeyMap[key] = key;
  io.ClipboardUserData = this;
  io.SetClipboardTextFn = [](void*, const char* text) {
    QGuiApplication::clipboard()->setText(QString::fromUtf8(text));
  };
  io.GetClipboardTextFn = [](void* user) -> const char* {
    auto* self = static_cast<ImGuiCanvas*>(user);
    self->clipboard_ = QGuiApplication::clipboard()->text().toStdString();
    return self->clipboard_.c_str();
  };
  // Frames are drawn on input only: a blinking cursor would need them all the time.
  io.ConfigInputTextCursorBlink = false;
  clock_.start();
}

ImGuiCanvas::~ImGuiCanvas() {
  if (gl_ready_) {
    makeCurrent();
    release_textures();
    destroy_device_objects();
    doneCurrent();
  }
  ImGui::DestroyContext(context_);
}

void ImGuiCanvas::make_current_context() const {
  ImGui::SetCurrentContext(context_);
}

bool ImGuiCanvas::wants_text_input() const {
  make_current_context();
  return ImGui::GetIO().WantTextInput;
}

void ImGuiCanvas::build_fonts() {
  make_current_context();
  ImGuiIO& io = ImGui::GetIO();
  const qreal ratio = std::max<qreal>(1.0, devicePixelRatioF());
  io.Fonts->Clear();
  // Latin, general punctuation, arrows and maths: the symbols the views print (·, …, ↵, →, ×).
  static const ImWchar ranges[] = {0x0020, 0x024F, 0x2000, 0x206F, 0x2190, 0x21FF,
                                   0x2200, 0x22FF, 0x25A0, 0x25FF, 0};
  ImFontConfig config;
  config.FontDataOwnedByAtlas = false;
  config.OversampleH = 2;
  const QByteArray& bytes = font_bytes();
  if (bytes.isEmpty()) {
    ui_font_ = io.Fonts->AddFontDefault();
    figure_font_ = ui_font_;
  } else {
    void* font_data = const_cast<char*>(bytes.constData());
    ui_font_ = io.Fonts->AddFontFromMemoryTTF(font_data, int(bytes.size()), float(15.0 * ratio),
                                              &config, ranges);
    // Figure text is drawn at many sizes from one larger raster.
    figure_font_ = io.Fonts->AddFontFromMemoryTTF(font_data, int(bytes.size()), float(26.0 * ratio),
                                                  &config, ranges);
  }
  io.FontGlobalScale = float(1.0 / ratio);
  unsigned char* pixels = nullptr;
  int width = 0, height = 0;
  io.Fonts->TexGlyphPadding = 2;  // room for pad_glyph_quads's texel, none shared
  io.Fonts->GetTexDataAsRGBA32(&pixels, &width, &height);
  pad_glyph_quads(*io.Fonts, config);
  if (font_texture_ == 0) glGenTextures(1, &font_texture_);
  glBindTexture(GL_TEXTURE_2D, font_texture_);
  glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_MIN_FILTER, GL_LINEAR);
  glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_MAG_FILTER, GL_LINEAR);
  glPixelStorei(GL_UNPACK_ALIGNMENT, 1);
  glTexImage2D(GL_TEXTURE_2D, 0, GL_RGBA, width, height, 0, GL_RGBA, GL_UNSIGNED_BYTE, pixels);
  io.Fonts->SetTexID(reinterpret_cast<ImTextureID>(intptr_t(font_texture_)));
  io.Fonts->ClearTexData();
  font_ratio_ = ratio;
}

void ImGuiCanvas::initializeGL() {
  if (!context() || !context()->isValid()) return;  // paintGL then draws nothing
  initializeOpenGLFunctions();
  gl_ready_ = true;
  create_device_objects();
  build_fonts();
}

void ImGuiCanvas::create_device_objects() {
  auto compile = [this](GLenum kind, const char* source) {
    const GLuint shader = glCreateShader(kind);
    glShaderSource(shader, 1, &source, nullptr);
    glCompileShader(shader);
    GLint ok = 0;
    glGetShaderiv(shader, GL_COMPILE_STATUS, &ok);
    if (!ok) {
      char log[1024];
      glGetShaderInfoLog(shader, sizeof log, nullptr, log);
      std::fprintf(stderr, "kvlens: shader compile failed: %s\n", log);
    }
    return shader;
  };
  const GLuint vertex = compile(GL_VERTEX_SHADER, kVertexShader);
  const GLuint fragment = compile(GL_FRAGMENT_SHADER, kFragmentShader);
  program_ = glCreateProgram();
  glAttachShader(program_, vertex);
  glAttachShader(program_, fragment);
  glLinkProgram(program_);
  glDeleteShader(vertex);
  glDeleteShader(fragment);
  projection_location_ = glGetUniformLocation(program_, "projection");
  texture_location_ = glGetUniformLocation(program_, "glyphs");
  glGenVertexArrays(1, &vertex_array_);
  glGenBuffers(1, &vertex_buffer_);
  glGenBuffers(1, &index_buffer_);
  glBindVertexArray(vertex_array_);
  glBindBuffer(GL_ARRAY_BUFFER, vertex_buffer_);
  glBindBuffer(GL_ELEMENT_ARRAY_BUFFER, index_buffer_);
  glEnableVertexAttribArray(0);
  glEnableVertexAttribArray(1);
  glEnableVertexAttribArray(2);
  glVertexAttribPointer(0, 2, GL_FLOAT, GL_FALSE, sizeof(ImDrawVert),
                        reinterpret_cast<void*>(offsetof(ImDrawVert, pos)));
  glVertexAttribPointer(1, 2, GL_FLOAT, GL_FALSE, sizeof(ImDrawVert),
                        reinterpret_cast<void*>(offsetof(ImDrawVert, uv)));
  glVertexAttribPointer(2, 4, GL_UNSIGNED_BYTE, GL_TRUE, sizeof(ImDrawVert),
                        reinterpret_cast<void*>(offsetof(ImDrawVert, col)));
  glBindVertexArray(0);
}

void ImGuiCanvas::destroy_device_objects() {
  if (!program_) return;
  glDeleteProgram(program_);
  glDeleteBuffers(1, &vertex_buffer_);
  glDeleteBuffers(1, &index_buffer_);
  glDeleteVertexArrays(1, &vertex_array_);
  if (font_texture_) glDeleteTextures(1, &font_texture_);
  program_ = vertex_buffer_ = index_buffer_ = vertex_array_ = font_texture_ = 0;
}

void* ImGuiCanvas::make_texture(const uint8_t* rgba, int width, int height) {
  GLuint texture = 0;
  glGenTextures(1, &texture);
  glBindTexture(GL_TEXTURE_2D, texture);
  glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_MIN_FILTER, GL_NEAREST);
  glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_MAG_FILTER, GL_NEAREST);
  glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_WRAP_S, GL_CLAMP_TO_EDGE);
  glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_WRAP_T, GL_CLAMP_TO_EDGE);
  glPixelStorei(GL_UNPACK_ALIGNMENT, 1);
  glTexImage2D(GL_TEXTURE_2D, 0, GL_RGBA, width, height, 0, GL_RGBA, GL_UNSIGNED_BYTE, rgba);
  textures_.push_back(texture);
  return reinterpret_cast<void*>(intptr_t(texture));
}

void ImGuiCanvas::release_textures() {
  if (!textures_.empty()) glDeleteTextures(GLsizei(textures_.size()), textures_.data());
  textures_.clear();
}

void ImGuiCanvas::resizeGL(int, int) {
  request_frames();
}

void ImGuiCanvas::request_frames(int count) {
  frames_wanted_ = std::max(frames_wanted_, count);
  update();
}

void ImGuiCanvas::set_animating(bool animating) {
  if (animating == animating_) return;
  animating_ = animating;
  request_frames();  // the first, and after the animation its last state settles
}

void ImGuiCanvas::set_help_open(bool open) {
  help_open_ = open;
  request_frames();
}

double ImGuiCanvas::frames_per_second() const {
  const double now = double(clock_.nsecsElapsed()) * 1e-9;
  return double(std::count_if(recent_frames_.begin(), recent_frames_.end(),
                              [now](double t) { return now - t <= 1.0; }));
}

std::optional<QPointF> ImGuiCanvas::find_text(const QString& text) const {
  make_current_context();
  const ImDrawData* draw = ImGui::GetDrawData();
  if (!draw || !draw->Valid) return std::nullopt;
  std::vector<uint32_t> wanted;
  for (const uint32_t c : text.toUcs4())
    if (!QChar::isSpace(c)) wanted.push_back(c);
  if (wanted.empty()) return std::nullopt;
  for (ImFont* font : {ui_font_, figure_font_}) {
    if (!font) continue;
    std::vector<const ImFontGlyph*> glyphs;
    for (const uint32_t c : wanted)
      if (const ImFontGlyph* glyph = font->FindGlyphNoFallback(ImWchar(c))) glyphs.push_back(glyph);
    if (glyphs.size() != wanted.size()) continue;
    for (int l = 0; l < draw->CmdListsCount; ++l) {
      const ImVector<ImDrawVert>& v = draw->CmdLists[l]->VtxBuffer;
      // A glyph's quad: top-left, top-right, bottom-right, bottom-left, each with its UV corner.
      auto is_glyph = [&](int i, const ImFontGlyph* g) {
        return i >= 0 && i + 3 < v.Size && v[i].uv.x == g->U0 && v[i].uv.y == g->V0 &&
               v[i + 2].uv.x == g->U1 && v[i + 2].uv.y == g->V1;
      };
      // Words are told apart by the gap between glyph quads: a space's advance is about a third
      // of the font's size, the bearings between letters of a word a fraction of that.
      float word_gap = 0;
      auto touches = [&](int left, int right) {  // glyph-like quads on one line, no gap
        if (left < 0 || right + 3 >= v.Size) return false;
        const bool glyphs_both =
            v[left].uv.x != v[left + 2].uv.x && v[right].uv.x != v[right + 2].uv.x;
        const bool same_line =
            v[left].pos.y < v[right + 2].pos.y && v[right].pos.y < v[left + 2].pos.y;
        const float gap = v[right].pos.x - v[left + 2].pos.x;
        return glyphs_both && same_line && gap > -1.0f && gap < word_gap;
      };
      const int count = int(glyphs.size());
      for (int i = 0; i + 4 * count <= v.Size; ++i) {
        bool match = true;
        for (int k = 0; k < count && match; ++k) match = is_glyph(i + 4 * k, glyphs[size_t(k)]);
        if (!match) continue;
        const float drawn_scale = (v[i + 2].pos.x - v[i].pos.x) / (glyphs[0]->X1 - glyphs[0]->X0);
        word_gap = 0.2f * font->FontSize * drawn_scale;
        if (touches(i - 4, i) || touches(i + 4 * (count - 1), i + 4 * count)) continue;
        const ImVec2 top_left = v[i].pos, bottom_right = v[i + 4 * (count - 1) + 2].pos;
        return QPointF((top_left.x + bottom_right.x) / 2, (top_left.y + bottom_right.y) / 2);
      }
    }
  }
  return std::nullopt;
}

void ImGuiCanvas::queue(Input input) {
  input_.push_back(std::move(input));
  request_frames();
}

void ImGuiCanvas::feed_input() {
  ImGuiIO& io = ImGui::GetIO();
  bool button_changed[ImGuiMouseButton_COUNT] = {};
  bool any_button_changed = false;
  std::vector<int> keys_changed;
  while (!input_.empty()) {
    const Input input = input_.front();
    switch (input.kind) {
      case Input::Kind::MousePos:
        if (any_button_changed) return;  // the button changed where it was pressed
        io.MousePos = ImVec2(input.x, input.y);
        break;
      case Input::Kind::MouseButton:
        if (button_changed[input.code]) return;
        button_changed[input.code] = any_button_changed = true;
        io.MouseDown[input.code] = input.down;
        break;
      case Input::Kind::Wheel:
        io.MouseWheel += input.y;
        io.MouseWheelH += input.x;
        break;
      case Input::Kind::Key:
        if (input.code >= 0) {
          if (std::find(keys_changed.begin(), keys_changed.end(), input.code) != keys_changed.end())
            return;
          keys_changed.push_back(input.code);
          io.KeysDown[input.code] = input.down;
        }
        break;
      case Input::Kind::Focus:
        io.AddFocusEvent(input.down);
        break;
    }
    if (input.kind != Input::Kind::Focus) {
      io.KeyCtrl = input.modifiers & Qt::ControlModifier;
      io.KeyShift = input.modifiers & Qt::ShiftModifier;
      io.KeyAlt = input.modifiers & Qt::AltModifier;
      io.KeySuper = input.modifiers & Qt::MetaModifier;
    }
    input_.pop_front();
    if (input.kind == Input::Kind::Key && input.down) key_pressed(input);
  }
}

void ImGuiCanvas::key_pressed(const Input& input) {
  ImGuiIO& io = ImGui::GetIO();
  // Whether a text field has the keyboard, as of the frame before this key: the keys queued
  // ahead of it have been seen by then.
  const bool typing = io.WantTextInput;
  if (!io.KeyCtrl && !io.KeyAlt && !input.text.isEmpty() && input.text[0].isPrint())
    io.AddInputCharactersUTF8(input.text.toUtf8().constData());
  if (typing) return;
  if (input.qt_key == Qt::Key_F1 || input.qt_key == Qt::Key_Question) {
    help_open_ = !help_open_;
  } else if (input.qt_key == Qt::Key_Escape && help_open_) {
    help_open_ = false;
  } else {
    // Emitted after this frame (not inside paintGL, where a handler opening a dialog would
    // re-enter the event loop), in the order the keys came.
    keys_to_emit_.push_back({input.qt_key, input.modifiers});
  }
}

void ImGuiCanvas::paintGL() {
  if (!gl_ready_) return;
  make_current_context();
  if (devicePixelRatioF() != font_ratio_) build_fonts();
  ImGuiIO& io = ImGui::GetIO();
  const qreal ratio = devicePixelRatioF();
  io.DisplaySize = ImVec2(float(width()), float(height()));
  io.DisplayFramebufferScale = ImVec2(float(ratio), float(ratio));
  const double now = double(clock_.nsecsElapsed()) * 1e-9;
  io.DeltaTime = float(std::max(1e-4, now - last_frame_seconds_));
  last_frame_seconds_ = now;
  frames_wanted_ = std::max(0, frames_wanted_ - 1);  // this one
  feed_input();
  ImGui::NewFrame();
  if (frame_) frame_();
  draw_help_overlay(&help_open_);
  ImGui::Render();
  render_draw_data(ImGui::GetDrawData());
  switch (ImGui::GetMouseCursor()) {
    case ImGuiMouseCursor_TextInput:
      setCursor(Qt::IBeamCursor);
      break;
    case ImGuiMouseCursor_Hand:
      setCursor(Qt::PointingHandCursor);
      break;
    case ImGuiMouseCursor_ResizeEW:
      setCursor(Qt::SizeHorCursor);
      break;
    case ImGuiMouseCursor_ResizeNS:
      setCursor(Qt::SizeVerCursor);
      break;
    default:
      setCursor(Qt::ArrowCursor);
      break;
  }
  if (!keys_to_emit_.empty()) {
    QMetaObject::invokeMethod(
        this,
        [this, keys = std::move(keys_to_emit_)] {
          --key_batches_in_flight_;
          for (const auto& [key, modifiers] : keys) emit unhandled_key(key, modifiers);
          request_frames();  // what the keys changed
        },
        Qt::QueuedConnection);
    keys_to_emit_.clear();
    ++key_batches_in_flight_;
  }
  ++frames_;
  recent_frames_.push_back(now);
  while (now - recent_frames_.front() > 1.0) recent_frames_.pop_front();
  emit frame_drawn();
  // The next frame: while input waits, animating, or frames were asked for. Otherwise none
  // until something happens.
  if (!input_.empty() || animating_ || frames_wanted_ > 0) update();
}

void ImGuiCanvas::render_draw_data(ImDrawData* draw) {
  const int fb_width = int(draw->DisplaySize.x * draw->FramebufferScale.x);
  const int fb_height = int(draw->DisplaySize.y * draw->FramebufferScale.y);
  if (fb_width <= 0 || fb_height <= 0) return;
  glViewport(0, 0, fb_width, fb_height);
  const ImVec4 background = ImGui::GetStyle().Colors[ImGuiCol_WindowBg];
  glClearColor(background.x, background.y, background.z, 1.0f);
  glClear(GL_COLOR_BUFFER_BIT);
  glEnable(GL_BLEND);
  glBlendEquation(GL_FUNC_ADD);
  glBlendFuncSeparate(GL_SRC_ALPHA, GL_ONE_MINUS_SRC_ALPHA, GL_ONE, GL_ONE_MINUS_SRC_ALPHA);
  glDisable(GL_CULL_FACE);
  glDisable(GL_DEPTH_TEST);
  glEnable(GL_SCISSOR_TEST);
  const float left = draw->DisplayPos.x, right = left + draw->DisplaySize.x;
  const float top = draw->DisplayPos.y, bottom = top + draw->DisplaySize.y;
  const float projection[16] = {2.0f / (right - left),
                                0,
                                0,
                                0,
                                0,
                                2.0f / (top - bottom),
                                0,
                                0,
                                0,
                                0,
                                -1.0f,
                                0,
                                (right + left) / (left - right),
                                (top + bottom) / (bottom - top),
                                0,
                                1.0f};
  glUseProgram(program_);
  glUniform1i(texture_location_, 0);
  glUniformMatrix4fv(projection_location_, 1, GL_FALSE, projection);
  glBindVertexArray(vertex_array_);
  glActiveTexture(GL_TEXTURE0);
  const ImVec2 clip_offset = draw->DisplayPos, clip_scale = draw->FramebufferScale;
  for (int n = 0; n < draw->CmdListsCount; ++n) {
    const ImDrawList* list = draw->CmdLists[n];
    glBindBuffer(GL_ARRAY_BUFFER, vertex_buffer_);
    glBufferData(GL_ARRAY_BUFFER, GLsizeiptr(list->VtxBuffer.Size) * sizeof(ImDrawVert),
                 list->VtxBuffer.Data, GL_STREAM_DRAW);
    glBindBuffer(GL_ELEMENT_ARRAY_BUFFER, index_buffer_);
    glBufferData(GL_ELEMENT_ARRAY_BUFFER, GLsizeiptr(list->IdxBuffer.Size) * sizeof(ImDrawIdx),
                 list->IdxBuffer.Data, GL_STREAM_DRAW);
    for (int c = 0; c < list->CmdBuffer.Size; ++c) {
      const ImDrawCmd& cmd = list->CmdBuffer[c];
      if (cmd.UserCallback) {
        if (cmd.UserCallback != ImDrawCallback_ResetRenderState) cmd.UserCallback(list, &cmd);
        continue;
      }
      const float x0 = (cmd.ClipRect.x - clip_offset.x) * clip_scale.x;
      const float y0 = (cmd.ClipRect.y - clip_offset.y) * clip_scale.y;
      const float x1 = (cmd.ClipRect.z - clip_offset.x) * clip_scale.x;
      const float y1 = (cmd.ClipRect.w - clip_offset.y) * clip_scale.y;
      if (x1 <= x0 || y1 <= y0) continue;
      glScissor(int(x0), int(float(fb_height) - y1), int(x1 - x0), int(y1 - y0));
      glBindTexture(GL_TEXTURE_2D, GLuint(intptr_t(cmd.GetTexID())));
      glDrawElementsBaseVertex(GL_TRIANGLES, GLsizei(cmd.ElemCount),
                               sizeof(ImDrawIdx) == 2 ? GL_UNSIGNED_SHORT : GL_UNSIGNED_INT,
                               reinterpret_cast<void*>(intptr_t(cmd.IdxOffset * sizeof(ImDrawIdx))),
                               GLint(cmd.VtxOffset));
    }
  }
  glBindVertexArray(0);
  glDisable(GL_SCISSOR_TEST);
}

void ImGuiCanvas::mouse_button(QMouseEvent* event, bool down) {
  queue(Input::mouse_at(event->position(), event->modifiers()));
  const int button = imgui_button(event->button());
  if (button < 0) return;
  Input input{Input::Kind::MouseButton};
  input.code = button;
  input.down = down;
  input.modifiers = event->modifiers();
  queue(input);
}

void ImGuiCanvas::mousePressEvent(QMouseEvent* event) {
  mouse_button(event, true);
}

void ImGuiCanvas::mouseReleaseEvent(QMouseEvent* event) {
  mouse_button(event, false);
}

void ImGuiCanvas::mouseMoveEvent(QMouseEvent* event) {
  queue(Input::mouse_at(event->position(), event->modifiers()));
}

void ImGuiCanvas::wheelEvent(QWheelEvent* event) {
  Input input{Input::Kind::Wheel};
  input.x = float(event->angleDelta().x()) / 120.0f;
  input.y = float(event->angleDelta().y()) / 120.0f;
  input.modifiers = event->modifiers();
  queue(input);
  event->accept();
}

void ImGuiCanvas::key_event(QKeyEvent* event, bool down) {
  // A held key's repeats that arrive while one of its presses still waits for a frame are
  // dropped: otherwise, with frames slower than the repeat rate, the queue grows and the key goes
  // on acting long after it was let go. Presses the user makes are never dropped.
  if (event->isAutoRepeat() &&
      std::any_of(input_.begin(), input_.end(), [event](const Input& queued) {
        return queued.kind == Input::Kind::Key && queued.qt_key == event->key();
      }))
    return;
  Input input{Input::Kind::Key};
  input.code = imgui_key(event->key());
  input.down = down;
  input.modifiers = event->modifiers();
  input.qt_key = event->key();
  if (down) input.text = event->text();
  queue(input);
}

void ImGuiCanvas::keyPressEvent(QKeyEvent* event) {
  key_event(event, true);
}

void ImGuiCanvas::keyReleaseEvent(QKeyEvent* event) {
  key_event(event, false);
}

void ImGuiCanvas::focusInEvent(QFocusEvent* event) {
  Input input{Input::Kind::Focus};
  input.down = true;
  queue(input);
  QOpenGLWidget::focusInEvent(event);
}

void ImGuiCanvas::focusOutEvent(QFocusEvent* event) {
  queue(Input{Input::Kind::Focus});
  QOpenGLWidget::focusOutEvent(event);
}

bool ImGuiCanvas::event(QEvent* event) {
  if (event->type() == QEvent::Leave)  // no hover once the pointer left
    queue(Input::mouse_at(QPointF(-FLT_MAX, -FLT_MAX), QGuiApplication::keyboardModifiers()));
  return QOpenGLWidget::event(event);
}

}  // namespace kvlens::app
